"""What the server holds of Tinker sessions while they live: each session with its models,
samplers and story (session), the hub that submits their requests to their engine host and
ends them (hub), the SDK's futures (futures), the host's answers as outcomes (answers), their
runs in the database (records) and the sweeper that ends the quiet and the stopped ones.
"""
