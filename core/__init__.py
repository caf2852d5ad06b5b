"""The kernel both processes stand on: facts and records shared by the server and the runner.

It imports nothing of ours from outside this package.
"""
