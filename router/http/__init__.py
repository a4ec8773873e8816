"""The HTTP plumbing: proxying requests and websockets, headers, and error replies."""
