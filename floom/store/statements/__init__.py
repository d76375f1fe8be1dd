"""How floom's statements reach the database driver: text made storable by both databases
(text), and the run path's statements run on the driver's connection (hot)."""
