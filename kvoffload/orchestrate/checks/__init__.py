"""The controller's checks: what `plan` refuses before a host is touched (controller.py) and the doctor
run over the lab (doctor.py, with the offload round trip and the cell-free pair check). The node-side
probe and verdicts live in kvoffload.doctor."""
