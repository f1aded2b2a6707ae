"""The Nodus API gateway: the nodus.dev/v1 HTTP API over the object store."""
