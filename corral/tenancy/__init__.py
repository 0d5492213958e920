"""Tenancy: who goes next and who must make room. Pure, below the faces (docs/tenancy.md)."""
