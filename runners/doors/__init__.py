"""What the doors to other frameworks' environments (Atropos, verifiers) share: scripts that run in
their interpreters (envside/), stdlib only."""
