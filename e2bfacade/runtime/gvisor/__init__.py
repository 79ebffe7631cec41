"""The gVisor driver (``SANDBOX_RUNTIME=gvisor``): see driver.py."""
