"""Code the tests share: helpers, live servers, stand-ins for hosted services, fake runners and
the reference client. Tests and conftests live in the folders beside it."""
