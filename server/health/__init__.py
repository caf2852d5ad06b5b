"""`GET /health` and the dashboard page at `/`: both open without a token."""
