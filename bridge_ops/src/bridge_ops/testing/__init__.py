"""bridge-ops' test tools: they import the core (`bridge`), so neither `plugin` nor any op
family imports this package; the lowerings stay free of the core at run time."""
