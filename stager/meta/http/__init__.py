"""The metadata server's HTTP side: its aiohttp app, auth routes, the gateway,
gauges and the dashboard."""
