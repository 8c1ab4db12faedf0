"""The data node's HTTP routes, one module per resource."""
