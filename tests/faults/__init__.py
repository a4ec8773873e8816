"""The fault suite: warmgate as a real process against engines that die, hang, dribble or are
cut off, and clients that crowd it; bounded in time, traffic only to 127.0.0.1. The Kubernetes
fault (the API server killed under traffic) is in tests/kube/test_faults_on_kube.py."""
