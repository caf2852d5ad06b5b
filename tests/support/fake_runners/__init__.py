"""Small child programs that play the runner's side of the contract, for supervision tests."""
