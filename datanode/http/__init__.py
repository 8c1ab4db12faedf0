"""The data node's HTTP face: the app, its routes and the fast dispatcher of the blob routes."""
