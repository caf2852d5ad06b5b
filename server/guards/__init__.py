"""HTTP guards applied to every request: loopback-or-token access, Host/Origin/JSON checks, the
body cap, and the one wording of validation errors."""
