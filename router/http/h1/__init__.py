"""The upstream HTTP/1.1 client: a sans-IO response framer, exchanges, the keep-alive pool."""
