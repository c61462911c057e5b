"""The ``<code>`` action's sandbox: parent.py runs untrusted code in an isolated subprocess and
proxies its API calls; child.py is that subprocess (run as a script, never imported)."""
