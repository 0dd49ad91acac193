"""What a run asks for: the params schema and its checks (``params``), the study designs and their
taxonomies (``designs``), the prompts and languages (``prompts``), the plan of every story a profile
asks for (``plan``) and the constants the studies fix (``studies``). Reads the core layer only."""
