from tandem.cli.commands import main

raise SystemExit(main())
