"""One module per `zoo` subcommand."""
