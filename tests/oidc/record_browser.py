"""A stand-in for the user's web browser, for ``$BROWSER``: it writes the address it is asked
to open to the file ``$OIDC_TEST_BROWSER_LOG`` (one per line) and exits 0, as a browser that
opened it would. The test then "uses the browser": it signs in on that page
(tests/oidc_provider.py, ``OpenIdProvider.login``) and follows the redirect to the program
that opened it."""

import os
import sys

with open(os.environ["OIDC_TEST_BROWSER_LOG"], "a", encoding="utf-8") as log:
    log.write(sys.argv[1] + "\n")
