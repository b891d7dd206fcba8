from __future__ import annotations

from sentinel.cli.main import main

raise SystemExit(main())
