"""The master's HTTP face: the app, its routes, the fast dispatcher and the metrics it serves."""
