"""squall client library and CLI. (The client library itself arrives with issue 5.)"""

__all__: list[str] = []
