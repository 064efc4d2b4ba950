"""Adaptive admission per replica: the load signal, the limit controller, the deadline-ordered queue, the layer."""
