module turnpike/gokong-decode

go 1.24.6

require github.com/kong/go-kong v0.77.0

require (
	github.com/google/go-querystring v1.1.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/imdario/mergo v0.3.16 // indirect
	github.com/kong/semver/v4 v4.0.1 // indirect
	github.com/mitchellh/mapstructure v1.5.0 // indirect
	github.com/tidwall/gjson v1.18.0 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.1 // indirect
)
