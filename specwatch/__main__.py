from specwatch.cli import main

raise SystemExit(main())
