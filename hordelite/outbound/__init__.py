"""Calls hordelite makes to the outside on a client's behalf: image URLs a
client named, webhooks it asked for. Every target is checked first
(``guarded_fetch``): no private address, no redirect past the check."""
