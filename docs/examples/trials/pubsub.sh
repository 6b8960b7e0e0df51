# Google's Pub/Sub emulator (a Java program that comes with the Google Cloud CLI:
# `gcloud components install pubsub-emulator beta`, or on Debian/Ubuntu
# `apt-get install google-cloud-cli-pubsub-emulator`), in the background, on port 8085.
gcloud beta emulators pubsub start --host-port=127.0.0.1:8085 > pubsub.log 2>&1 &
until python -c "import socket; socket.create_connection(('127.0.0.1', 8085), 1)" 2>/dev/null; do sleep 0.5; done

# Every Google client, the provider's included, talks to the emulator when this is set: set it in
# the triggerer's environment too. The connection then only names the project.
export PUBSUB_EMULATOR_HOST=127.0.0.1:8085
export AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT='{"conn_type": "google_cloud_platform", "extra": {"project": "local-trial"}}'

# The topic and its pull subscription (the stream reads projects/local-trial/subscriptions/orders).
python -c '
from google.cloud import pubsub_v1

topic = pubsub_v1.PublisherClient().create_topic(name="projects/local-trial/topics/orders")
pubsub_v1.SubscriberClient().create_subscription(
    name="projects/local-trial/subscriptions/orders", topic=topic.name
)
'
