"""What the server holds of Tinker sessions while they live: each session with its models,
samplers and story (session), the hub that submits their requests to the Tinker worker and
ends them (hub), the SDK's futures (futures), the worker's answers as outcomes (answers), their
runs in the database (records) and the sweeper that ends the quiet and the stopped ones.
"""
