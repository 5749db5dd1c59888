"""The wire protocol shared by servers and clients: paths, ranges, models, routes, headers.

Servers and clients both import this package; neither imports the other.
"""
