"""The postgres lane's own folder: the throwaway PostgreSQL server the tests start. Tests that
run on both databases are in the lane by their fixture, wherever they are."""
