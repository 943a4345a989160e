"""Images of chat requests: fetching those a client names by URL."""
