"""Our server's Tinker API (server/tinker_api) as the real tinker SDK sees it, against a live server
and its engine (the hosted Tinker service our runner uses is tests/hosted_tinker)."""
