"""``python -m core.endpoint_server``: a local model behind the OpenAI-compatible chat protocol. A
fixed name (users' scripts call it); the command is core/commands/endpoint.py."""
import sys

from core.commands.endpoint import main

if __name__ == "__main__":
    sys.exit(main())
