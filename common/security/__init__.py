"""Credentials, signed tokens, the access rule table and TLS configuration."""
