"""After the first token: the body handed to the caller, its stall/total watchdog, continuation."""
