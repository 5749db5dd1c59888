"""aiohttp pieces shared by every stager server: middleware, metrics, serving."""
