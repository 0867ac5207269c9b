"""What the controller ships and installs before cells run: the wheelhouse, the engine sets' pins, the
replay client's install and plan, and the hosts' Python. Runs pip and playbooks; knows no cell."""
