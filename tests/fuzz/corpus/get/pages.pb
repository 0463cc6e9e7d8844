
pagespages-1