"""The master's REST v1 routes, one module per resource."""
