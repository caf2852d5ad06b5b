"""Services: the logic behind the routes."""
