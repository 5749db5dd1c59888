"""The fault-injection scenarios of issue 7 (marker ``faults``)."""
