"""Everything HTTP: the server over Hypercorn, the strict wire and the
connection, the request and answer types, the one route table and its
dispatcher, and the envelopes refusals are written in."""
