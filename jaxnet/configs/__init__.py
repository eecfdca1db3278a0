"""The recipes that ship with jaxnet: each NAME.py here defines get_config([ARG]), run as
`jaxnet train --config=NAME[:ARG]` from any folder (`jaxnet recipes` lists them). A config
file of your own is given by its path instead: `--config=my_config.py[:ARG]`."""
