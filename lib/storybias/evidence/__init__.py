"""The studies' own evidence as input: StereoTales' published associations and reference taxonomy
(``published``)."""
