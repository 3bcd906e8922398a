from __future__ import annotations

from acp_bridge._cli import main

raise SystemExit(main())
