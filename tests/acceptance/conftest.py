"""The acceptance tier: what a user or a hostile tester does end to end, as processes (an install, the dashboard in
a browser, jobs under a launcher, decompression bombs). Shared helpers are in tests/support."""
