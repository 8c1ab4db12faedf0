"""The one HTTP/1.1 client engine every outgoing request of squall goes through."""
