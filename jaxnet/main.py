"""`python -m jaxnet.main`: the train and eval command (jaxnet/cli/main.py), under the name
the public command-line contract gives it."""

from jaxnet.cli.main import run

if __name__ == "__main__":
  run()
