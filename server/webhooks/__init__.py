"""Webhooks: registrations, the event outbox fanned out into signed deliveries, and the
dispatcher that sends them in order per run, retrying with backoff."""
