"""`pixelwire bench serve`: end-to-end serving benchmark of real vLLM servers
with and without the pixelwire frontend (see ``serve.py``)."""
