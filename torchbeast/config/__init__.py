"""Configuration at the edge, free of torch and gRPC (PolyBeast's env side uses it):
``flags`` and ``poly_flags`` declare the flag groups, ``parsers`` builds every entry
point's parser from them, ``reference`` the README's flag tables, and ``settings`` turns
parsed flags into the typed settings that ``core/`` takes."""
