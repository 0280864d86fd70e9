"""Configuration at the edge: ``flags`` builds every entry point's parser (no torch, so
PolyBeast's env side can use it), ``settings`` turns parsed flags into the typed settings
that ``core/`` takes."""
