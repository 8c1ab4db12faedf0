"""The server kit the master and the data nodes share (never imported by the client): the ASGI
guard, fast answers, metrics, serving with uvicorn, offline API docs."""
