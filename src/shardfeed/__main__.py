from shardfeed.cli.main import main

raise SystemExit(main())
