"""Configuration at the edge, free of torch and gRPC (PolyBeast's env side uses it).
Each setting is declared once, as a field of its settings class (``core.settings.flag``),
and ``declared`` turns such fields into flags; ``flags`` and ``poly_flags`` gather them
into the runtimes' flags, ``parsers`` builds every entry point's parser from them,
``reference`` the manual's flag tables, and ``settings`` turns parsed flags into the
typed settings that ``core/`` takes."""
